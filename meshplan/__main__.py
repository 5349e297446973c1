from meshplan.cli import entry

entry()
