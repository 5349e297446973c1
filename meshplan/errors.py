"""The one error type for bad user input: the CLI prints it as one line and exits with code 2."""

# Everything str.splitlines() breaks at: user text echoed in an error (a path, an argument) must not
# split the one-line message.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def one_line(text: str) -> str:
    """`text` with line-breaking characters shown as escapes (\\n, \\x85, ...)."""
    return "".join(repr(c)[1:-1] if c in LINE_BREAKS else c for c in text)


class InputError(ValueError):
    """Malformed or inconsistent input; `field` names where, the message says what is valid."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(one_line(f"{field}: {message}" if field else message))
