"""The one exception type for problems the user can fix.

The CLI turns a UserError into one paragraph on stderr and exit code 2; any other
exception is a bug and is allowed to show its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input, missing files, impossible requests: something the user can act on."""

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(self.paragraph())

    def paragraph(self) -> str:
        text = self.message.rstrip()
        if self.hint:
            text += " " + self.hint.strip()
        return text
