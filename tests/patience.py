"""How long a test waits for something that must happen: a command to end, a process to start, an
event to be set. Long enough for a 2-core machine loaded by other work, since a wait here is a net
against a hang, never a measurement: a test that needs it to be short is a race."""

PATIENCE_S = 900
