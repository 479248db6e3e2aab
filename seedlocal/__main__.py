from seedlocal.cli import run

run()
