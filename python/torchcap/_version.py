"""torchcap's version: the one place it is written. CMakeLists.txt reads it
for the project (the library's SONAME, `torchcap --version`)."""

__version__ = "0.4.0"
