"""The one error type for bad user input: the CLI prints it as one line and exits with code 2."""


class InputError(ValueError):
    """Malformed or inconsistent input; `field` names where, the message says what is valid."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
