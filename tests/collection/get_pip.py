"""ansible-test's pip bootstrap, without its download.

ansible-test creates an empty virtualenv for each sanity test and puts pip into it by running
get-pip.py, which it downloads from ci-files.testing.ansible.com, a host these machines cannot
reach. It looks in its cache first (~/.ansible/test/cache/get_pip_<version>.py), and this file
is what the test puts there: it does what get-pip.py does, installing the pip it is given
(`pip==24.2`) with pip itself, run from that version's wheel, downloaded from PyPI with its hash
(tests/collection/ansible-test-pip.lock) into the same cache directory (ansible-test passes
the bootstrap no environment of ours).
"""

import glob
import os
import sys

# get-pip.py's own options; pip does not know them.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}

wheels = glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pip-*.whl"))
if len(wheels) != 1:
    sys.exit(f"get_pip: expected one pip wheel beside {__file__}, found {wheels}")
sys.path.insert(0, wheels[0])

from pip._internal.cli.main import main  # noqa: E402  (importable only from the wheel above)

args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
sys.exit(main(["install", "--upgrade", "--force-reinstall", *args]))
