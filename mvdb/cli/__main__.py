from mvdb.cli import main

main()
