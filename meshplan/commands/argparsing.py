"""argparse that reports errors as one line with exit code 2 (argparse's own exit code for usage)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from meshplan.errors import one_line


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(one_line(f"{self.prog}: error: {message}"), file=sys.stderr)
        raise SystemExit(2)
