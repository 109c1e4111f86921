from clusterfed.cli import entry

entry()
