from ggtools.cli import entry

entry()
