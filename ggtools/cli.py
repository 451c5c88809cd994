import click
from ggtools import __version__

@click.group()
@click.version_option(__version__)
def main():
    """ggtools"""
