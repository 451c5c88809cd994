"""Bounded, seeded mutation fuzzing of GGUF and safetensors headers through inspect, validate, quantize, patch
and convert, and of model hyperparameters (values and types) through validate, doctor, run and quantize. Every run
must keep the hostile corpus's four properties (hostile_corpus.py): an exit code of 0, 1 or 2; on failure one line
on stderr and no traceback; inputs unchanged; no new file but the output.

The header mutator is hand-rolled and structure-aware: it walks the header itself (independently of ggtools'
reader) to find every count, length, type, dimension and offset, then sets one of them to a boundary or
random value, or flips bytes, or cuts the file. The hyperparameter mutator sets one key the runtime reads (or one
it does not have) to a boundary value of some GGUF type, or drops it, on a tiny model of every arch the runtime
runs and a drafter; a file the model-file rules refuse must be refused by run and quantize (in their words) and
failed by doctor. The seed is fixed: a failure names its case and replays.
"""

import json
import os
import shutil
import signal
import struct

import numpy as np
import pytest

from gguf import GGUFValueType as VT

from tests import gguf_builder as B
from tests.hostile_corpus import DEMO, _kimi_k3, check_run, run_cli, snapshot
from tests.stalled_cli import stop_while_stalled
from tests.test_convert_support import rewrite_gguf
from tests.tiny_targets import write_gpt_oss, write_qwen35

SEED = 12
GGUF_CASES = 400
SAFETENSORS_CASES = 60
U64_EDGES = [0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]


def pick(rng, values):
    """One of values (exact Python ints: numpy's choice would turn 2**64 - 1 into a float)."""
    return values[int(rng.integers(0, len(values)))]


def base_gguf() -> bytes:
    kvs = B.sample_kvs() + [B.kv_u32("general.alignment", 32), B.kv_str("general.name", "fuzz")]
    return B.build(kvs, B.sample_tensors())


def gguf_fields(data: bytes) -> list[tuple[str, int, int]]:
    """(kind, offset, size) of every header field: counts, lengths, types, dims, offsets."""
    fields = [("version", 4, 4), ("count", 8, 8), ("count", 16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(pos):
        fields.append(("length", pos, 8))
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        pos = string(pos)
        (vtype,) = struct.unpack_from("<I", data, pos)
        fields.append(("type", pos, 4))
        pos += 4
        if vtype == 8:
            pos = string(pos)
        elif vtype == 9:
            (elem,) = struct.unpack_from("<I", data, pos)
            fields += [("type", pos, 4), ("length", pos + 4, 8)]
            (count,) = struct.unpack_from("<Q", data, pos + 4)
            pos += 12
            for _ in range(count):
                pos = string(pos) if elem == 8 else pos + sizes[elem]
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        fields.append(("n_dims", pos, 4))
        pos += 4
        fields += [("dim", pos + 8 * i, 8) for i in range(n_dims)]
        pos += 8 * n_dims
        fields += [("type", pos, 4), ("offset", pos + 4, 8)]
        pos += 12
    return fields, pos


def mutate_gguf(data: bytes, rng) -> tuple[str, bytes]:
    fields, header_end = gguf_fields(data)
    op = rng.integers(0, 10)
    if op == 0:
        cut = int(rng.integers(0, len(data)))
        return f"truncate at {cut}", data[:cut]
    if op == 1:
        out = bytearray(data)
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(0, header_end))
            out[at] = int(rng.integers(0, 256))
        return "flip header bytes", bytes(out)
    kind, offset, size = fields[int(rng.integers(0, len(fields)))]
    if kind == "type":
        value = pick(rng, [0, 1, 8, 9, 12, 13, 14, 30, 31, 39, 40, 77, 2 ** 31, 2 ** 32 - 1])
    elif kind == "n_dims":
        value = pick(rng, [0, 1, 2, 3, 4, 5, 16, 17, 2 ** 32 - 1])
    elif kind == "version":
        value = pick(rng, [0, 1, 2, 4, 2 ** 24, 2 ** 32 - 1])
    else:
        current = int.from_bytes(data[offset:offset + size], "little")
        value = pick(rng, U64_EDGES + [current + 1, max(current - 1, 0), current * 2, int(rng.integers(0, 2 ** 20))])
    value %= 2 ** (8 * size)
    return f"{kind} at {offset} := {value}", data[:offset] + value.to_bytes(size, "little") + data[offset + size:]


GGUF_COMMANDS = [
    ("inspect", lambda p, o: ["inspect", p], []),
    ("validate", lambda p, o: ["validate", "--deep", p], []),
    ("quantize", lambda p, o: ["quantize", p, "-o", o, "--scheme", "q8_0", "-q"], ["out.gguf", "out.ggtools.json"]),
    ("patch", lambda p, o: ["patch", "set", p, "x.y=u8:1", "-o", o], ["out.gguf"]),
]


def gguf_cases():
    rng = np.random.default_rng(SEED)
    base = base_gguf()
    for i in range(GGUF_CASES):
        what, data = mutate_gguf(base, rng)
        name, command, outputs = GGUF_COMMANDS[i % len(GGUF_COMMANDS)]
        yield f"{i}-{name}: {what}", data, command, outputs


def test_gguf_header_mutations(tmp_path):
    """GGUF_CASES mutated headers, each through one of inspect, validate --deep, quantize and patch."""
    codes = {0: 0, 1: 0, 2: 0}
    for case, data, command, outputs in gguf_cases():
        d = tmp_path / case.split(":")[0]
        d.mkdir()
        path = d / "m.gguf"
        path.write_bytes(data)
        result = _check(d, command(str(path), str(d / "out.gguf")), [d / o for o in outputs], case)
        codes[result.exit_code] += 1
        shutil.rmtree(d)
    assert codes[2] > GGUF_CASES // 4 and codes[0] > 0        # the mutations reach both refusals and successes


def _check(root, args, outputs, case):
    try:
        return check_run(str(root), args, (0, 1, 2), outputs, reports=(1,) if args[0] in ("run", "accept") else ())
    except AssertionError as e:
        raise AssertionError(f"case {case}: {e}") from None


def mutate_safetensors(data: bytes, rng) -> tuple[str, bytes]:
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    op = rng.integers(0, 6)
    if op == 0:
        value = pick(rng, U64_EDGES + [n + 1, n - 1, len(data)])
        return f"header length := {value}", value.to_bytes(8, "little") + data[8:]
    if op == 1:
        cut = int(rng.integers(0, len(data)))
        return f"truncate at {cut}", data[:cut]
    names = sorted(k for k in header if k != "__metadata__")
    name = names[int(rng.integers(0, len(names)))]
    entry = header[name]
    if op == 2:
        key = ["dtype", "shape", "data_offsets"][int(rng.integers(0, 3))]
        entry[key] = [None, "x", -1, 2 ** 70, 1.5, [], {}, [1, -2], ["a"], "F8_E4M3", "BF16"][int(rng.integers(0, 11))]
        what = f"{name}.{key} := {entry[key]!r}"
    elif op == 3:
        which = int(rng.integers(0, len(entry["shape"]) or 1))
        if entry["shape"]:
            entry["shape"][which] = pick(rng, [0, 1, 3, 2 ** 31, 2 ** 62])
        what = f"{name}.shape := {entry['shape']}"
    elif op == 4:
        entry["data_offsets"][int(rng.integers(0, 2))] = pick(rng, [0, 1, 2 ** 32, len(body) + 1])
        what = f"{name}.data_offsets := {entry['data_offsets']}"
    else:
        del header[name]
        what = f"drop {name}"
    raw = json.dumps(header).encode()
    return what, struct.pack("<Q", len(raw)) + raw + body


def test_safetensors_header_mutations(tmp_path):
    """SAFETENSORS_CASES mutated checkpoint headers through convert dflash (llama.cpp profile)."""
    rng = np.random.default_rng(SEED + 1)
    base = open(os.path.join(DEMO, "drafter", "model.safetensors"), "rb").read()
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    for i in range(SAFETENSORS_CASES):
        what, data = mutate_safetensors(base, rng)
        d = tmp_path / f"case{i}"
        hf = d / "hf"
        hf.mkdir(parents=True)
        shutil.copy(os.path.join(DEMO, "drafter", "config.json"), hf)
        (hf / "model.safetensors").write_bytes(data)
        args = ["convert", "dflash", str(hf), "--target-gguf", target, "-o", str(d / "out.gguf"), "-q"]
        _check(d, args, [d / "out.gguf"], f"{i}: {what}")
        shutil.rmtree(d)


# ---- issue 39 (Trust III), convert: config.json values, safetensors byte ranges ------------------------------------

CONFIG_CASES = 64
RANGE_CASES = 30
# values a config.json number may hold instead: other JSON types, integers at and beyond the GGUF types' bounds,
# a billion layers, NaN / inf (Python's json reads them), beyond f32, a whole number as a float
CONFIG_VALUES = [None, "abc", "", True, [], {}, [1], -1, 0, 1, 2, 2 ** 31, 2 ** 32, 2 ** 64, 10 ** 9, 1.5, 8.0,
                 float("nan"), float("inf"), -float("inf"), 1e39, -1e-6]
# keys the converters read that the base checkpoints lack, with a valid value (then mutated like the others)
CONFIG_EXTRAS = {"sliding_window": 4, "use_sliding_window": True, "partial_rotary_factor": 0.5,
                 "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512,
                                  "beta_fast": 32.0}, "layer_types": ["sliding_attention", "full_attention"],
                 "final_logit_softcapping": 30.0, "output_multiplier": 1.0, "input_embedding_scale": 1.0,
                 "draft_vocab_size": 128, "markov_rank": 32, "num_target_layers": 8, "draft_block_size": 8}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A checkpoint of each config layout (DFlash v1 and DFlash2: dflash_config; DSpark: flat and speculators, whose
    backbone keys are nested), the tiny target they are for, and each converted (the drafters doctor --hf checks)."""
    from ggtools.jobs.convert import convert_dflash
    from tests.test_convert_support import make_checkpoint, make_dspark_checkpoint, make_target_gguf
    d = tmp_path_factory.mktemp("checkpoints")
    target = str(make_target_gguf(d / "target.gguf"))
    dirs = {"v1": make_checkpoint(d / "v1", 1), "v2": make_checkpoint(d / "v2", 2),
            "flat": make_dspark_checkpoint(d / "flat"),
            "speculators": make_dspark_checkpoint(d / "speculators", arch="DSparkSpeculator", layout="speculators")}
    drafters = {}
    for name, hf in dirs.items():
        drafters[name] = str(d / f"{name}.gguf")
        convert_dflash(hf, drafters[name], target=target)
    return target, dirs, drafters


def number_places(node, path=()):
    """The key path of every number in a JSON value (list elements too, and each list of numbers as a whole)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from number_places(value, path + (key,))
    elif isinstance(node, list) and node and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                 for x in node):
        yield path
        for i in range(len(node)):
            yield path + (i,)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


def mutate_config(config: dict, rng) -> str:
    """One number of config.json (or of a key the converters read, added) set to a hostile value, in place."""
    if rng.random() < 0.3:
        key = pick(rng, sorted(CONFIG_EXTRAS))
        config[key] = json.loads(json.dumps(CONFIG_EXTRAS[key]))
    path = pick(rng, list(number_places(config)))
    value = pick(rng, CONFIG_VALUES)
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return f"{'.'.join(map(str, path))} := {value!r}"


def test_config_value_mutations(tmp_path, checkpoints):
    """CONFIG_CASES checkpoints with one config.json number mutated (each layout in turn) through convert dflash (both
    profiles) and doctor --hf: the four properties, and one verdict: what convert writes, validate passes (a command
    never writes what its own validate rejects)."""
    target, dirs, drafters = checkpoints
    rng = np.random.default_rng(SEED + 5)
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(CONFIG_CASES):
        layout = sorted(dirs)[i % len(dirs)]
        config = json.loads((dirs[layout] / "config.json").read_text())
        what = mutate_config(config, rng)
        case = f"{i}-{layout}: {what}"
        d = tmp_path / str(i)
        hf = shutil.copytree(dirs[layout], d / "hf")
        (hf / "config.json").write_text(json.dumps(config))
        out = d / "out.gguf"
        profile = ["--profile", "lucebox"] if i % 8 == 0 and layout == "v1" else ["--target-gguf", target]
        convert = ["convert", "dflash", str(hf), *profile, "-o", str(out), "-q"]
        r = _check(d, convert, [out], case)            # (removes the output it checks)
        assert r.exit_code in (0, 2), case
        codes[r.exit_code] += 1
        if r.exit_code == 0:
            run_cli(convert)
            v = _check(d, ["validate", str(out)], [], case)
            assert v.exit_code == 0, f"case {case}: convert wrote a file validate fails: {v.stdout[-400:]}"
            out.unlink()
        if i % 3 == 0:
            _check(d, ["doctor", drafters[layout], "--hf", str(hf)], [], case)
        shutil.rmtree(d)
    assert codes[2] > CONFIG_CASES // 2 and codes[0] > 0, codes     # the mutations reach refusals and successes


# ---- issue 41: EAGLE3 checkpoints' config.json through convert drafter and doctor --hf --------------------------

EAGLE3_CONFIG_CASES = 40
# keys the EAGLE3 converter reads that the demo checkpoint lacks, with a valid value (then mutated like the others)
EAGLE3_EXTRAS = {"target_hidden_size": 128, "head_dim": 32, "norm_before_residual": True,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}


def test_eagle3_config_value_mutations(tmp_path):
    """EAGLE3_CONFIG_CASES demo EAGLE3 checkpoints with one config.json number mutated (or a key it reads added)
    through convert drafter and doctor --hf: the four properties; what convert writes, validate passes."""
    from ggtools.jobs.convert_drafter import convert_drafter
    from scripts.fixtures import dspark_checkpoints as DS
    from scripts.fixtures import eagle3_drafters as E3
    target = os.path.join(DEMO, "target.gguf")
    base = DS.write_dspark(tmp_path / "base", *E3.demo_checkpoint())
    good = convert_drafter(base, str(tmp_path / "good.gguf"), target=target).path
    rng = np.random.default_rng(SEED + 41)
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(EAGLE3_CONFIG_CASES):
        config = json.loads((base / "config.json").read_text())
        if rng.random() < 0.3:
            key = pick(rng, sorted(EAGLE3_EXTRAS))
            config[key] = json.loads(json.dumps(EAGLE3_EXTRAS[key]))
        path = pick(rng, list(number_places(config)))
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = pick(rng, CONFIG_VALUES)
        case = f"{i}: {'.'.join(map(str, path))} := {node[path[-1]]!r}"
        d = tmp_path / str(i)
        hf = shutil.copytree(base, d / "in" / "hf")
        (hf / "config.json").write_text(json.dumps(config))
        out = d / "out.gguf"          # outside the watched inputs: check_run would remove an output it lists
        r = _check(d / "in", ["convert", "drafter", str(hf), "--target-gguf", target, "-o", str(out), "-q"], [], case)
        assert r.exit_code in (0, 2), case
        codes[r.exit_code] += 1
        if r.exit_code == 0:
            v = _check(d, ["validate", str(out)], [], case)
            assert v.exit_code == 0, f"case {case}: convert wrote a file validate fails: {v.stdout[-400:]}"
            out.unlink()
        if i % 4 == 0:
            _check(d, ["doctor", good, "--hf", str(hf)], [], case)
        shutil.rmtree(d)
    assert codes[2] > EAGLE3_CONFIG_CASES // 4 and codes[0] > EAGLE3_CONFIG_CASES // 8, codes


def mutate_ranges(header: dict, rng) -> str:
    """The tensors' data_offsets rearranged, sizes kept: two tensors of one size swap ranges (still a tiling), one
    takes another's range (an overlap), every range moves by a few bytes (a gap), or one range is cut in two."""
    names = sorted(k for k in header if k != "__metadata__")
    size = {n: header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in names}
    op = int(rng.integers(0, 4))
    a = pick(rng, names)
    same = [n for n in names if n != a and size[n] == size[a]]
    if op == 0 and same:
        b = pick(rng, same)
        header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
        return f"swap {a} and {b}"
    if op <= 1 and same:
        b = pick(rng, same)
        header[a]["data_offsets"] = list(header[b]["data_offsets"])
        return f"{a} takes the range of {b}"
    if op == 2:
        shift = pick(rng, [2, 4, 8])
        for n in names:
            header[n]["data_offsets"] = [x + shift for x in header[n]["data_offsets"]]
        return f"every range moves by {shift}"
    begin, end = header[a]["data_offsets"]
    header[a]["data_offsets"] = [begin + 2, end + 2]
    return f"{a} moves by 2"


def test_safetensors_range_mutations(tmp_path):
    """RANGE_CASES rearrangements of the demo drafter's tensor ranges through convert dflash: refused (exit 2, one line
    naming the tensor) exactly when safetensors' own reader refuses the file."""
    from safetensors import safe_open
    rng = np.random.default_rng(SEED + 6)
    base = open(os.path.join(DEMO, "drafter", "model.safetensors"), "rb").read()
    (n,) = struct.unpack_from("<Q", base)
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    verdicts = set()
    for i in range(RANGE_CASES):
        header = json.loads(base[8:8 + n])
        what = mutate_ranges(header, rng)
        d = tmp_path / f"case{i}"
        hf = d / "hf"
        hf.mkdir(parents=True)
        shutil.copy(os.path.join(DEMO, "drafter", "config.json"), hf)
        raw = json.dumps(header).encode()
        (hf / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + base[8 + n:])
        try:
            with safe_open(hf / "model.safetensors", framework="np") as st:     # parses and checks the header
                st.keys()
            reference = 0
        except Exception:       # noqa: BLE001 (the reference's own error type)
            reference = 2
        args = ["convert", "dflash", str(hf), "--target-gguf", target, "-o", str(d / "out.gguf"), "-q"]
        r = _check(d, args, [d / "out.gguf"], f"{i}: {what}")
        assert r.exit_code == reference, f"case {i}: {what}: exit {r.exit_code}, safetensors: {reference}: {r.stderr}"
        if reference:
            assert "model.safetensors: tensor '" in r.stderr, r.stderr
        verdicts.add(reference)
        shutil.rmtree(d)
    assert verdicts == {0, 2}


@pytest.mark.parametrize("seed", [SEED])
def test_mutator_reaches_every_field_kind(seed):
    fields, _ = gguf_fields(base_gguf())
    assert {k for k, _, _ in fields} == {"version", "count", "length", "type", "n_dims", "dim", "offset"}


# ---- the command level: option values, prompts files, stop signals -----------------------------------------------

COMMAND_CASES = 60
PROMPT_FILE_CASES = 40
SIGNAL_CASES = 8
INTS = ["0", "-1", "1", "2", "7", "100000", str(2 ** 31), str(2 ** 32 - 1), str(2 ** 63), "1e9", "nan", "", "9" * 400,
        "\udcff"]
FLOATS = ["nan", "-nan", "inf", "-inf", "1e308", "1e-400", "-0.0", "0.5", "1", "2", "", "\udcff"]
TEXTS = ["\udcff", "x\udc80y", "\ud800", "a\u2028b", "\u0085", "a" * 100_000, ""]      # argv holds no NUL
IDS = ["1,2", "-1", "5000", "2048", "99999999999999999999", "1,,2", "\udcff", "1 2 3", ""]
DRAFTING = {"--ring-cap": INTS, "--n-max": INTS, "--p-min": FLOATS, "--n-min": INTS, "--threads": INTS, "-n": INTS,
            # issue 39 (Trust III) A: a draft tree's budget and ranks (accept: a list, "4," + each value)
            "--tree-budget": INTS + ["4," + v for v in INTS], "--tree-top-k": INTS}
# issue 42: the sampler's options (accept: --temp is a list)
SAMPLING = {"--top-k": INTS, "--top-p": FLOATS, "--min-p": FLOATS, "--typical": FLOATS, "--top-nsigma": FLOATS,
            "--repeat-penalty": FLOATS, "--repeat-last-n": INTS, "--seed": INTS,
            "--samplers": TEXTS + ["top_k;temp", "bogus", "infill", ";", "TOP-K;Nucleus"]}
OPTIONS = {
    "run": DRAFTING | SAMPLING | {"--min-acceptance": FLOATS, "--prompt": TEXTS, "--prompt-ids": IDS,
                                  "--temp": FLOATS},
    "accept": DRAFTING | {"--max-drop": FLOATS, "--min-tau": FLOATS, "--min-acceptance": FLOATS, "--baseline": TEXTS},
}
# issue 42 part 4 (test_accept.py's class): accept's temperatures (a list, "0," + each value) and seeds per temperature
OPTIONS["accept"] |= SAMPLING | {"--temp": FLOATS + ["0," + v for v in FLOATS] + ["0.5,0.5", "0,0.8,1"],
                                 "--seeds": INTS}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from ggtools.jobs.convert import convert_dflash
    d = tmp_path_factory.mktemp("pair")
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), d / "target.gguf")
    convert_dflash(os.path.join(DEMO, "drafter"), d / "drafter.gguf", profile="llama.cpp", target=target)
    (d / "two.jsonl").write_text('{"prompt": "def main():"}\n{"prompt_ids": [1, 2, 3]}\n')
    return d


def command_cases(d):
    """Each case: a run or accept invocation with one to three options set to hostile or boundary values."""
    rng = np.random.default_rng(SEED + 2)
    bases = {"run": ["run", "--target", str(d / "target.gguf"), "--draft", str(d / "drafter.gguf"), "--prompt-ids",
                     "1,2", "-n", "4", "--cut", "prob"],
             "accept": ["accept", "--target", str(d / "target.gguf"), "--draft", str(d / "drafter.gguf"), "--prompts",
                        str(d / "two.jsonl"), "-n", "2", "-q", "--temp", "0,0.8", "--seed", "5"]}
    for i in range(COMMAND_CASES):
        name = ("run", "accept")[i % 2]
        args = list(bases[name])
        for _ in range(int(rng.integers(1, 4))):
            option = pick(rng, sorted(OPTIONS[name]))
            value = pick(rng, OPTIONS[name][option])
            for given in (("--prompt", "--prompt-ids") if option in ("--prompt", "--prompt-ids") else (option,)):
                if given in args:
                    at = args.index(given)
                    del args[at:at + 2]
            args += [option, value]
        yield f"{i}: {' '.join(a[:20] for a in args[1:])}", args


def test_command_line_mutations(pair):
    """Hostile option values (NaN gates, huge counts and sizes, text that is not UTF-8) for run and accept:
    refused with one line, or run within the bounds."""
    codes = {0: 0, 1: 0, 2: 0}
    for case, args in command_cases(pair):
        codes[_check(pair, args, [], case).exit_code] += 1
    assert codes[2] > COMMAND_CASES // 3 and codes[0] + codes[1] > 0


ENV_CASES = 12
ENV_VALUES = ["on", "off", "auto", "1", "0", "yes", "no", "true", "false", ""]


def mutate_setting(rng) -> str:
    """An accepted value of an environment setting, or one changed: case, a space around it, a letter dropped or
    doubled, a character that is not ASCII."""
    value = pick(rng, ENV_VALUES)
    op = int(rng.integers(0, 5))
    if op == 0:
        return value.upper()
    if op == 1:
        return pick(rng, [" ", "\t", "\n"]) + value if rng.integers(0, 2) else value + " "
    if op == 2 and value:
        at = int(rng.integers(0, len(value)))
        return value[:at] + value[at + 1:] if rng.integers(0, 2) else value[:at] + value[at] + value[at:]
    if op == 3:
        return value + pick(rng, ["\u00e9", "\u2028", "x"])
    return value


def test_environment_mutations(pair):
    """issue 39 (Trust III) C: mutated values of every environment setting ggtools reads through run: each runs, or
    is refused with one line naming the variable (never run as the default)."""
    from ggtools.environment import SETTINGS
    rng = np.random.default_rng(SEED + 5)
    args = ["run", "--target", str(pair / "target.gguf"), "--prompt-ids", "1,2", "-n", "2"]
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(ENV_CASES):
        name, value = pick(rng, sorted(SETTINGS)), mutate_setting(rng)
        with pytest.MonkeyPatch.context() as env:
            env.setenv(name, value)
            result = _check(pair, args, [], f"{i}: {name}={value!r}")
        codes[result.exit_code] += 1
        assert result.exit_code == 0 or f"environment variable {name}=" in result.stderr, (name, value)
    assert codes[0] and codes[2]


PROMPT_INSERTS = ["\u2028", "\u2029", "\u0085", "\r", "\x00", "\\ud800", "\\udfff\\ud800", "\ufeff", "\\u0000",
                  "[" * 50_000, '"', "\\", "\n", "{}", "1e999", "-5", "\udcff"]


def mutate_prompts(rng) -> tuple[str, bytes]:
    lines = ['{"prompt": "def main():", "id": "a"}', '{"prompt_ids": [1, 2, 3], "id": 2}', '{"prompt": "x y"}']
    op = int(rng.integers(0, 4))
    if op == 0:
        line = int(rng.integers(0, len(lines)))
        at = int(rng.integers(0, len(lines[line]) + 1))
        insert = pick(rng, PROMPT_INSERTS)
        lines[line] = lines[line][:at] + insert + lines[line][at:]
        what = f"insert {insert[:8]!r} at {line}:{at}"
    elif op == 1:
        key, value = pick(rng, [("prompt_ids", "[2048]"), ("prompt_ids", "[-1]"), ("prompt_ids", "[1.5]"),
                                ("prompt_ids", f"[{2 ** 64}]"), ("prompt_ids", "[true]"), ("prompt_ids", "[]"),
                                ("prompt", '"' + "\\n" * 600 + '"'), ("prompt", '"' + "z" * 5000 + '"'),
                                ("prompt", "null"), ("id", "[1]"), ("id", '"a"'), ("id", "1e3")])
        lines[1] = f'{{"{key}": {value}}}'
        what = f"{key} := {value[:20]}"
    elif op == 2:
        depth = pick(rng, [1, 100, 10_000, 200_000])
        lines[2] = "[" * depth + "]" * depth
        what = f"nesting {depth}"
    else:
        lines = lines[:int(rng.integers(0, len(lines) + 1))]
        what = f"{len(lines)} lines"
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    return what, data


def test_prompt_file_mutations(pair, tmp_path):
    """Mutated JSONL prompts files through accept: every line separator, escape, nesting depth and id type."""
    rng = np.random.default_rng(SEED + 3)
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(PROMPT_FILE_CASES):
        what, data = mutate_prompts(rng)
        d = tmp_path / f"case{i}"
        d.mkdir()
        (d / "p.jsonl").write_bytes(data)
        args = ["accept", "--target", str(pair / "target.gguf"), "--draft", str(pair / "drafter.gguf"), "--prompts",
                str(d / "p.jsonl"), "-n", "2", "-q"]
        codes[_check(d, args, [], f"{i}: {what}").exit_code] += 1
        shutil.rmtree(d)
    assert codes[2] > 0 and codes[0] > 0


STOP_POINTS = {     # command -> functions its run passes through (one is stalled and the signal sent there)
    "accept": (["accept", "--target", "{target}", "--draft", "{hf}", "-n", "2", "-q", "--report", "{out}/r.md"],
               ["ggtools.jobs.accept:convert_drafter", "ggtools.jobs.accept:TargetModel", "ggtools.jobs.accept:measure",
                "ggtools.jobs.accept:load_prompts", "ggtools.jobs.accept_report:write_bytes",
                "ggtools.gguf.outputs:AtomicOutput.commit", "ggtools.jobs.accept:temporary_directory"]),
    "gguf-layout": (["convert", "gguf-layout", "{drafter}", "--to", "lucebox", "-o", "{out}/l.gguf"],
                    ["ggtools.gguf.outputs:AtomicOutput.commit", "ggtools.gguf.outputs:AtomicOutput.open",
                     "ggtools.gguf.outputs:remove_stale_temps", "ggtools.engine.rewrite:GGUFWriter"]),
}


@pytest.mark.slow
def test_stop_signals_at_fuzzed_points(pair, tmp_path):
    """SIGTERM, SIGHUP or ^C at a seeded point of accept (HF drafter converted into $TMPDIR, a report) or convert
    gguf-layout: exit 128 + n, one line, no temporary directory or file, no output, inputs unchanged."""
    rng = np.random.default_rng(SEED + 4)
    hf = shutil.copytree(os.path.join(DEMO, "drafter"), pair / "hf", dirs_exist_ok=True)
    files = {"target": str(pair / "target.gguf"), "drafter": str(pair / "drafter.gguf"), "hf": str(hf)}
    for i in range(SIGNAL_CASES):
        name = sorted(STOP_POINTS)[i % len(STOP_POINTS)]
        args, points = STOP_POINTS[name]
        point = pick(rng, points)
        sig = pick(rng, [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
        case = tmp_path / f"case{i}"
        out = case / "out"
        out.mkdir(parents=True)
        before = snapshot(pair)
        p, stderr, tmp, _ = stop_while_stalled([a.format(out=out, **files) for a in args], point, sig, case)
        what = f"case {i}: {name} stopped by {sig.name} in {point}: exit {p.returncode}, {stderr!r}"
        assert p.returncode == 128 + sig, what
        assert stderr.splitlines() == ["error: interrupted" + ("" if sig == signal.SIGINT else f" by {sig.name}")], what
        assert os.listdir(tmp) == [], what
        assert os.listdir(out) == [], what
        assert snapshot(pair) == before, what


# ---- hyperparameters ---------------------------------------------------------------------------------------------

HPARAM_CASES = 160
NAN, INF = float("nan"), float("inf")
# GGUF type -> (element type for arrays, boundary values)
HOSTILE_VALUES = [
    (VT.UINT32, None, [0, 1, 2, 3, 7, 64, 513, 2 ** 31, 2 ** 32 - 1]),
    (VT.INT32, None, [-1, 0, 2, -2 ** 31]),
    (VT.UINT64, None, [4, 2 ** 63]),
    (VT.FLOAT32, None, [NAN, INF, -INF, 0.0, -1.0, 1e-30, 1e30, 0.5, 4.0]),
    (VT.FLOAT64, None, [NAN, 1.0]),
    (VT.STRING, None, ["", "4", "yarn", "none"]),
    (VT.BOOL, None, [True]),
    (VT.ARRAY, VT.INT32, [[], [0], [-1, 2], [1, 1, 1, 1], [2 ** 31 - 1] * 4, [0, 0, 0, 0], [2, 1, 1, 0]]),
    (VT.ARRAY, VT.UINT32, [[4, 4, 4, 4], [0, 0, 0, 0, 0]]),
    (VT.ARRAY, VT.FLOAT32, [[NAN, 1.0, 1.0, 1.0]]),
    (VT.ARRAY, VT.STRING, [["2", "3"]]),
    (VT.ARRAY, VT.BOOL, [[True, False, True, True], [False]]),
]
# keys a model may lack that the runtime reads (after "<arch>.")
ABSENT_KEYS = ["nextn_predict_layers", "attention.scale", "rope.scaling.type", "rope.scaling.factor",
               "rope.freq_base_swa", "expert_count", "expert_used_count", "attention.sliding_window",
               "attention.sliding_window_pattern", "rope.dimension_sections", "attention.recurrent_layers",
               "full_attention_interval", "rope.dimension_count", "attention.causal", "embedding_scale",
               # issue 42: the model's sampling defaults (whole keys)
               "general.sampling.top_k", "general.sampling.top_p", "general.sampling.temp",
               "general.sampling.sequence", "general.sampling.penalty_last_n", "tokenizer.ggml.suppress_tokens"]


@pytest.fixture(scope="module")
def hparam_models(tmp_path_factory):
    from ggtools.jobs.convert import convert_dflash
    d = tmp_path_factory.mktemp("models")
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), d / "target.gguf")
    drafter, lucebox = d / "drafter.gguf", d / "lucebox.gguf"
    convert_dflash(os.path.join(DEMO, "drafter"), drafter, profile="llama.cpp", target=target)
    convert_dflash(os.path.join(DEMO, "drafter"), lucebox, profile="lucebox")
    return {"target": str(target), "q35": write_qwen35(d / "q35.gguf"), "oss": write_gpt_oss(d / "oss.gguf"),
            "drafter": str(drafter), "lucebox": str(lucebox),
            "k3": _kimi_k3(d / "k3.gguf", {}, layers=True)}     # issue 39: keys that size its tensors


def hparam_keys(path) -> tuple[str, dict]:
    """The model's arch and its hyperparameter keys -> (type, element type)."""
    from ggtools.gguf import GGUFFile
    with GGUFFile(path) as f:
        arch = f.architecture
        return arch, {kv.key: (kv.vtype, kv.elem_type) for kv in f.kvs
                      if kv.key.startswith(arch + ".") or kv.key == "tokenizer.ggml.mask_token_id"}


def mutate_hparams(path, rng) -> tuple[str, list, list]:
    """(what, keys set, keys dropped): one key of the model (or one it lacks) set to a boundary value of its own
    type (half the time) or of another, or dropped."""
    arch, keys = hparam_keys(path)
    absent = pick(rng, ABSENT_KEYS)
    absent = absent if absent.startswith(("general.", "tokenizer.")) else f"{arch}.{absent}"
    key = pick(rng, sorted(keys)) if rng.random() < 0.8 else absent
    if key in keys and rng.random() < 0.12:
        return f"drop {key}", [], [key]
    own = [entry for entry in HOSTILE_VALUES if key in keys and entry[:2] == keys[key]]
    vtype, elem, values = own[0] if own and rng.random() < 0.5 else pick(rng, HOSTILE_VALUES)
    value = pick(rng, values)
    what = f"{key} := {vtype.name}{f'[{elem.name}]' if elem else ''} {value!r}"
    return what, [(key, vtype, value, elem)], []


def hparam_cases():
    rng = np.random.default_rng(SEED + 2)
    names = ["target", "q35", "oss", "drafter", "lucebox", "k3"]
    for i in range(HPARAM_CASES):
        yield i, names[i % len(names)], rng


def test_hyperparameter_mutations(tmp_path, hparam_models):
    """HPARAM_CASES models with one hyperparameter mutated, each through validate, doctor, run (2 tokens) and
    quantize's plan: the four properties, and one verdict: a file the model-file rules refuse is failed by validate
    and doctor and refused by run and quantize in the rules' words; one they pass never crashes run; quantize plans
    exactly what validate passes."""
    from ggtools.gguf import GGUFFile
    from ggtools.hparam_rules import model_violations
    refused = ran = 0
    for i, name, rng in hparam_cases():
        what, set_keys, drop_keys = mutate_hparams(hparam_models[name], rng)
        case = f"{i}-{name}: {what}"
        d = tmp_path / str(i)
        d.mkdir()
        path = str(rewrite_gguf(hparam_models[name], d / "m.gguf", set_keys=set_keys, drop_keys=drop_keys))
        with GGUFFile(path) as f:
            violations = model_violations(f)
        drafter = name in ("drafter", "lucebox")
        few = ["--prompt-ids", "1,2,3", "-n", "2"]
        run = ["run", "--target", hparam_models["target"], "--draft", path, *few] if drafter else \
            ["run", "--target", path, *few]
        doctor = ["doctor", path] + (["--hf", os.path.join(DEMO, "drafter")] if i % 2 else []) if drafter else \
            ["doctor", hparam_models["drafter"], "--target", path]
        v = _check(d, ["validate", path], [], case)
        r = _check(d, run, [], case)
        doc = _check(d, doctor, [], case)
        # issue 39: quantize (its plan: --dry-run) refuses what validate fails and plans what it passes
        q = _check(d, ["quantize", path, "-o", str(d / "q.gguf"), "--scheme", "q8_0", "--dry-run"], [], case)
        assert q.exit_code == (2 if v.exit_code else 0), f"case {case}: {q.stderr}"
        if violations:
            refused += 1
            assert v.exit_code == 1 and doc.exit_code == 1, case
            assert r.exit_code == 2 and str(violations[0]) in r.stderr, f"case {case}: {r.stderr}"
            assert violations[0].where in q.stderr and violations[0].rule in q.stderr, f"case {case}: {q.stderr}"
        elif r.exit_code == 0:
            ran += 1
        shutil.rmtree(d)
    assert refused > HPARAM_CASES // 4 and ran > HPARAM_CASES // 8, (refused, ran)


def test_hyperparameter_mutator_reaches_every_model_and_type():
    rng = np.random.default_rng(SEED + 2)
    kinds = {(vtype, elem) for vtype, elem, _ in HOSTILE_VALUES}
    seen = set()
    for _ in range(400):
        vtype, elem, _ = pick(rng, HOSTILE_VALUES)
        seen.add((vtype, elem))
    assert seen == kinds


# ---- issue 41, MTP (test_mtp.py's class): the keys that place an MTP block, through convert mtp and validate ---------

MTP_CASES = 40
MTP_KEYS = ["block_count", "nextn_predict_layers", "attention.recurrent_layers", "full_attention_interval",
            "embedding_length", "ssm.state_size"]


def test_mtp_key_mutations(tmp_path):
    """A qwen35 target with its MTP block (tests/mtp_files.py), one key that places or sizes the block mutated (or
    dropped): convert mtp (the sidecar, then --strip) keeps the four properties, refuses exactly what validate fails or
    what holds no MTP block, and what it writes validate passes."""
    from tests.mtp_files import write_qwen35_mtp
    rng = np.random.default_rng(SEED + 6)
    base = write_qwen35_mtp(tmp_path / "base.gguf")
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(MTP_CASES):
        key = "qwen35." + pick(rng, MTP_KEYS)
        d = tmp_path / str(i)
        d.mkdir()
        if rng.random() < 0.15:
            what, set_keys, drop_keys = f"drop {key}", [], [key]
        else:
            vtype, elem, values = pick(rng, HOSTILE_VALUES)
            value = pick(rng, values)
            what, set_keys, drop_keys = f"{key} := {vtype.name} {value!r}", [(key, vtype, value, elem)], []
        case = f"{i}: {what}"
        path = str(rewrite_gguf(base, d / "m.gguf", set_keys=set_keys, drop_keys=drop_keys))
        valid = _check(d, ["validate", path], [], case).exit_code == 0
        for strip in ([], ["--strip"]):
            out = tmp_path / "out.gguf"           # outside d: kept (check_run removes the outputs it is given)
            r = _check(d, ["convert", "mtp", *strip, path, "-o", str(out), "-q"], [], case)
            codes[r.exit_code] += 1
            assert r.exit_code in (0, 2) and (r.exit_code == 2 or valid), f"case {case}: {r.stderr}"
            if r.exit_code == 0:
                assert _check(d, ["validate", str(out)], [], case).exit_code == 0, case
                out.unlink()
            assert not out.exists()
        shutil.rmtree(d)
    assert codes[0] and codes[2], codes


# ---- issue 41 part 5 (test_eagle3_mtp.py's class): an EAGLE3 drafter's and an MTP model's keys, through run --draft --

DRAFTING_CASES = 40


def test_drafting_key_mutations(tmp_path):
    """An EAGLE3 drafter of the demo target and a qwen35 target with its MTP block (tests/mtp_files.py), one key
    mutated or dropped (hparam_keys: the arch's keys and ones it lacks), each run drafting (`--draft e3.gguf`,
    `--draft mtp`): the four properties, a file the model-file rules refuse refused in their words (exit 2), and the
    rest either drafting or refused in one line."""
    from ggtools.gguf import GGUFFile
    from ggtools.hparam_rules import model_violations
    from ggtools.jobs.convert_drafter import convert_drafter
    from scripts.fixtures import dspark_checkpoints as DS
    from scripts.fixtures import eagle3_drafters as E3
    from tests.mtp_files import write_qwen35_mtp
    target = str(shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf"))
    e3 = str(convert_drafter(DS.write_dspark(tmp_path / "e3_hf", *E3.demo_checkpoint()), tmp_path / "e3.gguf",
                             target=target, outtype="f16").path)
    mtp = str(write_qwen35_mtp(tmp_path / "q35_mtp.gguf"))
    rng = np.random.default_rng(SEED + 7)
    codes = {0: 0, 1: 0, 2: 0}
    for i in range(DRAFTING_CASES):
        base = (e3, mtp)[i % 2]
        what, set_keys, drop_keys = mutate_hparams(base, rng)
        case = f"{i}-{'eagle3' if base == e3 else 'mtp'}: {what}"
        d = tmp_path / str(i)
        d.mkdir()
        path = str(rewrite_gguf(base, d / "m.gguf", set_keys=set_keys, drop_keys=drop_keys))
        with GGUFFile(path) as f:
            violations = model_violations(f)
        few = ["--prompt-ids", "1,2,3", "-n", "3", "--full-kv"]
        run = ["run", "--target", target, "--draft", path, *few] if base == e3 else \
            ["run", "--target", path, "--draft", "mtp", *few]
        r = _check(d, run, [], case)
        codes[r.exit_code] += 1
        if violations:
            assert r.exit_code == 2 and str(violations[0]) in r.stderr, f"case {case}: {r.stderr}"
        shutil.rmtree(d)
    assert codes[0] and codes[2], codes
