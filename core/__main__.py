from mmcore.cli import main

main()
