"""Set point sync: the pure decisions (`decisions`), the last synced state on disk
(`state_file`), and the loop that applies them to controller and store (`setpoint`)."""
