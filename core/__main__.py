from mmcore.cli.commands import main

main()
