"""The command line: one module per `meshplan` command, holding its argument parsing and
printing; each is a short sequence of calls into the library packages, which know nothing of it."""
