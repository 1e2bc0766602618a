"""The one kind of error the app shows a person as is."""


class UserError(Exception):
    """A message for the person using the app (shown as is)."""
