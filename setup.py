"""Packages discovered, not listed: every folder under the four top-level ones is a package.

One import namespace: the top-level folders envs/, servers/ and trainers/ install as
agentgym.envs, agentgym.servers and agentgym.trainers, so users import one package and
readers find each part at the top of the repository. An env's tests (envs/NAME/tests)
stay out of the wheel; everything else in a package folder ships with it (an env's page,
training layer, hosting declaration and data). The rest of the metadata is pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

NAMESPACE = {
    "agentgym": "agentgym",
    "agentgym.envs": "envs",
    "agentgym.servers": "servers",
    "agentgym.trainers": "trainers",
}
NOT_SHIPPED = ["tests", "*.tests", "__pycache__", "*.__pycache__"]


def packages() -> list[str]:
    found = []
    for name, folder in NAMESPACE.items():
        found += [name, *(f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=NOT_SHIPPED))]
    return found


setup(
    package_dir=NAMESPACE,
    packages=packages(),
    package_data={
        "": ["*.yaml", "*.toml", "*.md", "*.json", "*.json.gz", "*.txt", "*.tmpl"],
        "agentgym.viewer.static": ["*"],
    },
)
