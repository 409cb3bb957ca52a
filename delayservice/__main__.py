from delayservice.cli.app import main

main()
