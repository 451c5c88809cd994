"""The environment settings ggtools reads, each declared once with the values it accepts, and the one reader of
them: a value that is not one of them (a misspelling, `off ` with a trailing space) is refused, naming the variable,
the value and the accepted values, rather than taken as the default.

    GGTOOLS_EXPERT_PAGING       on | off | auto (default): page routed experts (runtime/weights.py)
    GGTOOLS_CHECK_DIRECT_CALLS  1 | 0 (default): check each one-call kernel's argument types
                                (runtime/kernels/direct_call.py; the tests set it)

Values are compared without regard to case; on / off also read 1 / 0, yes / no, true / false.
"""

import os

from ggtools.errors import GGToolsError

ON, OFF = ("on", "1", "yes", "true"), ("off", "0", "no", "false")

# name -> (accepted values -> meaning, the meaning when unset)
SETTINGS = {
    "GGTOOLS_EXPERT_PAGING": ({**dict.fromkeys(ON, True), **dict.fromkeys(OFF, False), "auto": "auto"}, "auto"),
    "GGTOOLS_CHECK_DIRECT_CALLS": ({**dict.fromkeys(ON, True), **dict.fromkeys(OFF, False)}, False),
}


class SettingError(GGToolsError):
    """An environment setting with a value it does not accept (exit 2)."""


def setting(name: str):
    """The meaning of environment setting `name` (SETTINGS): its value's, or the default when it is unset or empty;
    SettingError for any other value."""
    accepted, default = SETTINGS[name]
    value = os.environ.get(name, "")
    if value == "":
        return default
    if value.lower() not in accepted:
        raise SettingError(f"environment variable {name}={value!r}: not one of {', '.join(accepted)}")
    return accepted[value.lower()]


def check_environment() -> None:
    """Refuse any setting of SETTINGS that holds a value it does not accept."""
    for name in SETTINGS:
        setting(name)
