"""python -m bestofn.bench {generate,scorers,pipeline,serve,codec,export,database} [options].

The recorded command of every benchmark figure; it forwards to ``bestofn.lab.bench``, so the
product's packages never import the lab.
"""

import sys

from bestofn.lab.bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
