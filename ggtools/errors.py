"""The one base class every layer's error derives from, so the CLI can report any of them in one line."""


class GGToolsError(Exception):
    """An error meant for a person: the message names the file, the place and the rule."""

    exit_code = 2
