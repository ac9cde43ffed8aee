from llmctl.cli.main import main

main()
