"""Finding: one thing doctor / pair-check found about a drafter GGUF, with what it does to each runtime it breaks.

A finding carries its severity, the runtimes it breaks with what each shows (the runtime's own words where it
prints any, quoted as its source prints them; the symptom otherwise), and the command that fixes it. A rule
whose inputs are missing does not pass: it is `unchecked`, and counts as a failure.
"""

from dataclasses import dataclass

ERROR, WARNING, OK, UNCHECKED = "error", "warning", "ok", "unchecked"
FAILING = (ERROR, UNCHECKED)


@dataclass(frozen=True)
class Effect:
    runtime: str                  # "llama.cpp" | "lucebox" | "ggtools"
    says: str | None              # the runtime's own words (error or log line), None where it says nothing
    symptom: str | None = None    # what the user sees, where the words alone do not say it

    def as_dict(self):
        return {k: v for k, v in vars(self).items() if v is not None}

    def __str__(self):
        parts = [f'"{self.says}"' if self.says else None, self.symptom]
        return f"{self.runtime}: " + " -- ".join(p for p in parts if p)


@dataclass
class Finding:
    check: str                    # the finding class: mask_token_id, rope_theta, target_layers, ...
    severity: str                 # error | warning | ok | unchecked
    message: str
    effects: tuple = ()           # Effect per runtime it breaks
    fix: str | None = None        # the command that fixes it

    @property
    def runtimes(self) -> list[str]:
        return [e.runtime for e in self.effects]

    def says(self, runtime: str) -> str | None:
        return next((e.says for e in self.effects if e.runtime == runtime), None)

    def as_dict(self):
        out = {"check": self.check, "severity": self.severity, "message": self.message}
        if self.effects:
            out["breaks"] = [e.as_dict() for e in self.effects]
        if self.fix:
            out["fix"] = self.fix
        return out


def ok(check: str, message: str) -> Finding:
    return Finding(check, OK, message)


def unchecked(check: str, message: str, fix: str | None = None) -> Finding:
    return Finding(check, UNCHECKED, f"not checkable: {message}", (), fix)


def failed(findings) -> list[Finding]:
    return [f for f in findings if f.severity in FAILING]
