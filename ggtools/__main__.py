from ggtools.cli import main

main()
