"""The active/standby pair: who may drive the line, and when."""
