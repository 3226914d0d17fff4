"""Set point sync: the pure decisions (`decisions`) and the sync record (`record`), the last
synced state on disk (`state_file`), and each device's sync (`device`), which carries the
decisions out on its controller and in the store."""
