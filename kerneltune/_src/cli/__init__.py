"""The command line: the command tables and parser (`main`), one module per command
(or group of commands), and the demo. The top layer: it may import everything, and
nothing else in the package imports from here."""
