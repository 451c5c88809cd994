"""The embedded demo pair's maker (docs/demo_pair.md)."""
