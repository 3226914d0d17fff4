"""One serial line with many controllers on it: the bus schedule (pure: which transaction
goes next), and the bus that carries it out on a port, one transaction at a time. The
timing of the medium itself is the drivers' (`agent.controller.timing`)."""
