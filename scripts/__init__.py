"""Developer scripts, run from the repository root with `python -m scripts.<folder>.<name>`:
fixtures/ (oracle artifacts the tests use), bench/ (benchmarks), demo_pair/ (makes ggtools/data/demo),
make_moe_shards (a synthetic MoE shard set). Not installed with ggtools."""
