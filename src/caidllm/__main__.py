import sys

from caidllm.cli import main

sys.exit(main())
