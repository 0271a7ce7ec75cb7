import sys

from specls.cli import main

sys.exit(main())
