"""The sampling options `run` and `accept` share, named as llama.cpp's (--temp, --top-k, --top-p, --min-p, --typical,
--top-nsigma, --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty, --samplers, --seed).

--temp 0 (the default) is greedy decoding; any other option of the chain needs a temperature above 0. Options not
given take the model's general.sampling.* defaults, then llama.cpp's (top_k 40, top_p 0.95, min_p 0.05, ...).
`run` takes one temperature and one seed; `accept` a list of temperatures and --seeds N seeds from --seed on.
"""

import click

from ggtools.cli.params import Count, FiniteFloatRange
from ggtools.jobs.errors import UsageError
from ggtools.jobs.sampling import MAX_SEED, sampler_names

# option -> SamplingParams field
CHAIN_OPTIONS = {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "typical": "typ_p", "top_nsigma": "top_n_sigma",
                 "repeat_penalty": "penalty_repeat", "repeat_last_n": "penalty_last_n",
                 "presence_penalty": "penalty_present", "frequency_penalty": "penalty_freq", "samplers": "samplers",
                 "mirostat": "mirostat", "xtc_probability": "xtc_probability"}


class TemperatureList(click.ParamType):
    """T[,T...]: distinct finite temperatures, each 0 or more."""

    name = "T[,T...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        temps = []
        for text in value.replace(" ", "").split(","):
            temps.append(FiniteFloatRange(min=0).convert(text, param, ctx))
        if len(set(temps)) != len(temps):
            self.fail(f"{value!r}: a temperature given twice", param, ctx)
        return temps


class SamplerNames(click.ParamType):
    name = "NAMES"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            return sampler_names(value)
        except UsageError as e:
            self.fail(str(e).removeprefix("--samplers: "), param, ctx)


def sampling_options(many: bool):
    """The options (run: one --temp and --seed; accept, many=True: --temp T,T... and --seeds N)."""
    options = [
        click.option("--temp", "temps" if many else "temp", type=TemperatureList() if many else FiniteFloatRange(min=0),
                     default=["0"] if many else 0.0, show_default=True, multiple=many,
                     help=("Sampling temperatures, e.g. 0,0.6,1.0 (or --temp 0 --temp 0.6): each drafter is measured "
                           "at each (0: greedy)." if many else
                           "Sampling temperature (0: greedy decoding, llama.cpp's --temp otherwise).")),
        click.option("--seed", type=Count(min=0, max=MAX_SEED),
                     help="RNG seed of the target's sampler (default: a random one, always reported)"
                          + (": the first of --seeds consecutive seeds." if many else ".")),
        *([click.option("--seeds", type=Count(min=1, max=1000), default=1, show_default=True,
                        help="Seeds per temperature above 0 (mean and spread over them).")] if many else []),
        click.option("--top-k", type=Count(min=0), help="Top-k sampling (0: off; default 40 or the model's)."),
        click.option("--top-p", type=FiniteFloatRange(0, 1), help="Top-p sampling (1: off; default 0.95)."),
        click.option("--min-p", type=FiniteFloatRange(0, 1), help="Min-p sampling (0: off; default 0.05)."),
        click.option("--typical", type=FiniteFloatRange(0, 1), help="Locally typical sampling p (1: off)."),
        click.option("--top-nsigma", type=FiniteFloatRange(), help="Top-n-sigma sampling (<= 0: off)."),
        click.option("--repeat-penalty", type=FiniteFloatRange(min=0, min_open=True),
                     help="Penalize repeated tokens (1: off)."),
        click.option("--repeat-last-n", type=Count(min=0), help="Tokens the penalties look back on (default 64)."),
        click.option("--presence-penalty", type=FiniteFloatRange(), help="Presence penalty (0: off)."),
        click.option("--frequency-penalty", type=FiniteFloatRange(), help="Frequency penalty (0: off)."),
        click.option("--samplers", type=SamplerNames(),
                     help="The chain's order, llama.cpp's names separated by ';' (default: penalties;dry;top_n_sigma;"
                          "top_k;typ_p;top_p;min_p;xtc;temperature)."),
        click.option("--mirostat", type=Count(min=0, max=0), help="0: off (to override a model's mirostat default)."),
        click.option("--xtc-probability", type=FiniteFloatRange(0, 0),
                     help="0: off (to override a model's XTC default)."),
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


def temperature_list(groups) -> list[float]:
    """accept's --temp values, each option's list in turn (--temp 0 --temp 0.6 is --temp 0,0.6); a temperature given
    twice is refused."""
    temps = [t for group in groups for t in group]
    twice = next((t for i, t in enumerate(temps) if t in temps[:i]), None)
    if twice is not None:
        raise UsageError("--temp", f"{twice:g}: a temperature given twice")
    return temps


def sampling_setup(temps, **given) -> dict:
    """The SamplingParams fields the user gave; refused when no temperature samples (they would change nothing)."""
    chain = {CHAIN_OPTIONS[name]: value for name, value in given.items() if value is not None}
    if chain and not any(t > 0 for t in temps):
        names = ", ".join("--" + name.replace("_", "-") for name, value in given.items() if value is not None)
        raise UsageError(names, "needs --temp above 0: at temperature 0 decoding is greedy, and the sampler chain "
                                "changes nothing")
    return chain
