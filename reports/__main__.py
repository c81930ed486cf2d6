from h3bench.reports.cli import main

main()
