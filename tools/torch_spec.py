"""Print the torch requirement `make` installs first.

Where pip is configured with a folder of local torch wheels (find-links, as on the project's
CPU machines), pin that wheel's version so pip never pulls a multi-GB CUDA build instead;
elsewhere print plain ``torch`` and let pip choose the build for the machine.
"""

import glob
import os
import subprocess
import sys

listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
for line in listing.splitlines():
    key, _, value = line.partition("=")
    if key.endswith("find-links"):
        for folder in value.strip().strip("'\"").split():
            wheels = sorted(glob.glob(os.path.join(folder, "torch-*.whl")))
            if wheels:
                print("torch==" + os.path.basename(wheels[-1]).split("-")[1].split("+")[0])
                sys.exit(0)
print("torch")
