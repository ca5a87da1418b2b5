from dpmf.cli.main import run

run()
