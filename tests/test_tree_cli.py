"""Where people see the draft tree: `ggtools run --draft … --tree-budget N` and `ggtools accept --tree-budget
N[,M…]` on the embedded demo pair: the settings and statistics in the text and the JSON, each tree beside its
drafter's chain in accept's table, JSON, Markdown report and plot; a tree's τ per prompt in accept equals what
`run --draft --tree-budget` gives for that prompt alone; a tree whose output differs from greedy fails its drafter;
the chain keeps its cut while the trees are never cut."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.jobs.run import TargetOnly
from ggtools.runtime import TargetModel, Tokenizer

TARGET = str(demo_data() / "target.gguf")
N = 24


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree-cli")
    paths = {v.name: v.path for v in build_drafters(d, TARGET)}
    model = TargetModel(TARGET, threads=1)
    chosen = held_out_prompts(Tokenizer.from_gguf(model.weights.meta), 2, 64)
    model.close()
    prompts = d / "held-out.jsonl"
    prompts.write_text("".join(json.dumps({"id": name, "prompt_ids": ids}) + "\n" for name, ids in chosen))
    return d, paths, str(prompts), chosen


def _cli(*args):
    return CliRunner().invoke(main, [*args, "--target", TARGET, "--threads", "1"])


@pytest.fixture(scope="module")
def accepted(work):
    _, paths, prompts, _ = work
    r = _cli("accept", "--draft", paths["f16"], "--draft", paths["dspark f16"], "--prompts", prompts, "-n", str(N),
             "-q", "--tree-budget", "4,22", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_run_tree_json_and_text(work):
    _, paths, _, chosen = work
    ids = ",".join(map(str, chosen[0][1]))
    r = _cli("run", "--draft", paths["f16"], "--prompt-ids", ids, "-n", str(N), "--tree-budget", "22", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["outputs_match_target"] and out["failures"] == []
    assert out["settings"]["tree_budget"] == 22 and out["settings"]["tree_top_k"] == 8       # lucebox's K
    stats = out["stats"]
    assert stats["drafted_tokens"] <= 22 * stats["steps"] and stats["verified_per_step"] > 8
    r = _cli("run", "--draft", paths["f16"], "--prompt-ids", ids, "-n", str(N), "--tree-budget", "7")
    assert r.exit_code == 0, r.output
    assert "draft tree of 7 nodes, top-K 1" in r.stderr and "output equals target-only greedy decoding" in r.stderr


def test_accept_reports_each_tree_beside_its_chain(accepted):
    assert accepted["tree_budgets"] == [4, 22] and accepted["verdict"] == "pass"
    for d in accepted["drafters"]:
        chain = d["run"]["stats"]
        assert [t["budget"] for t in d["trees"]] == [4, 22]
        for t in d["trees"]:
            run = t["run"]
            assert run["outputs_match_target"] and run["outputs"] == accepted["reference_outputs"]
            assert run["settings"]["tree_budget"] == t["budget"] and run["settings"]["cut"] == "none"
            assert run["settings"]["tree_top_k"] == (1 if t["budget"] <= d["run"]["settings"]["n_max"] else 8)
            al = run["stats"]["mean_accepted_length_incl_bonus"]
            assert t["delta_mean_len"] == pytest.approx(al - chain["mean_accepted_length_incl_bonus"])
        assert d["run"]["settings"]["tree_budget"] is None
        # 22 nodes reach further than the chain; 4 nodes (a chain of 4) not as far as its 7 or 8 drafts
        tree_22 = d["trees"][1]["run"]["stats"]
        assert tree_22["mean_accepted_length_incl_bonus"] > chain["mean_accepted_length_incl_bonus"]


@pytest.mark.parametrize("index, budget", [(0, 4), (1, 22)])
def test_accept_tree_tau_per_prompt_equals_run(work, accepted, index, budget):
    _, paths, _, chosen = work
    name = ["f16", "dspark f16"][index]
    tree = accepted["drafters"][index]["trees"][[4, 22].index(budget)]["run"]
    for i, (_, ids) in enumerate(chosen):
        r = _cli("run", "--draft", paths[name], "--prompt-ids", ",".join(map(str, ids)), "-n", str(N),
                 "--tree-budget", str(budget), "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["stats"]["tau_zlab"] == tree["tau_per_prompt"][i]


def test_accept_table_report_and_plot(work, tmp_path):
    pytest.importorskip("matplotlib")
    _, paths, prompts, _ = work
    report, plot = tmp_path / "r.md", tmp_path / "p.svg"
    r = _cli("accept", "--draft", paths["f16"], "--prompts", prompts, "-n", "12", "-q", "--tree-budget", "22,64",
             "--tree-top-k", "4", "--report", str(report), "--plot", str(plot))
    assert r.exit_code == 0, r.output
    assert "Draft tree (DDTree) beside each drafter's chain:" in r.stdout
    assert "draft trees of 22, 64 nodes (top-K 4)" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("drafter-f16.gguf") and " yes" in line]
    assert len(rows) == 3            # the chain's row and one per tree
    section = report.read_text().split("## Draft tree (DDTree) beside the chain")[1].split("\n## ")[0]
    assert section.count("| drafter-f16.gguf | ") == 2 and "| drafter-f16.gguf | 64 | 4 |" in section
    axes = [g for g in ET.parse(plot).getroot().iter("{http://www.w3.org/2000/svg}g")
            if g.get("id", "").startswith("axes_")]
    assert len(axes) == 3


def test_accept_cuts_the_chain_not_the_trees(work):
    _, paths, prompts, _ = work
    r = _cli("accept", "--draft", paths["f16"], "--prompts", prompts, "-n", "12", "-q", "--tree-budget", "22",
             "--cut", "margin", "--p-min", "0.35", "--n-min", "1", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["drafters"][0]
    assert d["run"]["settings"]["cut"] == "margin" and d["trees"][0]["run"]["settings"]["cut"] == "none"
    assert d["run"]["stats"]["verified_per_step"] < d["trees"][0]["run"]["stats"]["verified_per_step"]


def test_a_tree_that_differs_from_greedy_fails_its_drafter(work, monkeypatch):
    """The reference changed after the chain's pass: only the trees' outputs can differ from it."""
    _, paths, prompts, _ = work
    real, calls = TargetOnly.output, []

    def changed(self, i):
        tokens = real(self, i)
        calls.append(i)
        return tokens if len(calls) <= 2 else tokens[:-1] + [(tokens[-1] + 1) % 2046]

    monkeypatch.setattr(TargetOnly, "output", changed)
    r = _cli("accept", "--draft", paths["f16"], "--prompts", prompts, "-n", "12", "-q", "--tree-budget", "22")
    assert r.exit_code == 1
    assert ("FAIL: drafter-f16.gguf: output with a draft tree of 22 differs from target-only greedy decoding on 2 of 2 "
            "prompts") in r.stderr


# ---- issue 39 (Trust III) A: what a tree budget can be ---------------------------------------------------------------

@pytest.mark.parametrize("k, depth", [(1, 7), (2, 1), (2, 3), (3, 4), (8, 4), (5, 5)])
def test_the_node_bound_is_what_build_tree_builds_when_nothing_stops_it(k, depth):
    """most_tree_nodes(k, depth): the nodes lucebox's build_ddtree (runtime/ddtree.py, checked against it node for
    node) adds from depth positions of k equally likely ranks when the budget never stops it."""
    from ggtools.runtime.ddtree import build_tree, most_tree_nodes
    lp = np.log(np.full((depth, k), 1 / k, np.float32))
    tree = build_tree(lp, np.tile(np.arange(k), (depth, 1)), 10 ** 9)
    assert most_tree_nodes(k, depth, 10 ** 9) == tree.n_nodes
    assert most_tree_nodes(k, depth, tree.n_nodes - 1) == tree.n_nodes       # counted just past the cap
    assert most_tree_nodes(k, 10 ** 12, 1000) == 1001                        # a huge depth costs nothing


def test_a_budget_beyond_the_tree_is_refused_and_the_bound_runs(work):
    """2 ranks over 3 positions give at most 2 + 4 + 8 = 14 nodes: 14 runs, 15 is refused naming both (the budget
    used to be spent on a tree that could never grow to it: 2^31 ended in a 5.22 TiB MemoryError)."""
    _, paths, _, chosen = work
    ids = ",".join(map(str, chosen[0][1]))
    base = ["run", "--draft", paths["f16"], "--prompt-ids", ids, "-n", "8", "--tree-top-k", "2", "--n-max", "3"]
    r = _cli(*base, "--tree-budget", "14", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["outputs_match_target"]
    r = _cli(*base, "--tree-budget", "15")
    assert r.exit_code == 2 and "--tree-budget 15: more than the 14 nodes" in r.stderr, r.output
    assert "top-K 2 (--tree-top-k) at each of the step's 3 positions (--n-max) gives at most 2 + 2^2 + 2^3" in r.stderr


@pytest.mark.parametrize("command", ["run", "accept"])
def test_a_tree_whose_verify_cannot_fit_is_refused(work, command):
    """A budget under the tree's bound (2396744 nodes for 8 ranks over 7 positions) whose verify needs more memory than
    there is: (nodes + 1)^2 bytes per visibility mask. It decoded for minutes, or ended in an internal MemoryError."""
    _, paths, prompts, chosen = work
    args = (["run", "--prompt-ids", ",".join(map(str, chosen[0][1])), "--tree-budget", "1000000"] if command == "run"
            else ["accept", "--prompts", prompts, "-q", "--tree-budget", "4,1000000"])
    r = _cli(*args, "--draft", paths["f16"], "-n", "8")
    assert r.exit_code == 2, r.output
    assert "--tree-budget 1000000: verifying a draft tree of 1000000 nodes" in r.stderr and "TiB" in r.stderr


@pytest.mark.parametrize("budget", ["9" * 400, "4," + "9" * 400, "9" * 5000])
def test_an_absurd_budget_is_refused_as_it_is_parsed(work, budget):
    _, paths, prompts, _ = work
    command = ("run", "--prompt-ids", "1,2") if "," not in budget and len(budget) < 1000 else \
        ("accept", "--prompts", prompts, "-q")
    r = _cli(*command, "--draft", paths["f16"], "--tree-budget", budget)
    assert r.exit_code == 2 and "digits) is more than 2147483647" in r.stderr and len(r.stderr) < 300, r.output
