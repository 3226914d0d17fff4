"""One serial line with many controllers on it: the timing of the line, the bus schedule
(pure), and the bus that carries it out on a port, one transaction at a time."""
