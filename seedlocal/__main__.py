import sys

from seedlocal.cli import main

sys.exit(main())
