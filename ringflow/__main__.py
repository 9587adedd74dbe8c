from ringflow.cli import main

main()
