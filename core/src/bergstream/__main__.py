from bergstream.cli import main

main()
