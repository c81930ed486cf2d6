from h3bench.cli import main

main()
