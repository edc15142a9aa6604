"""Running the ranks inside container images: the runtimes' launch words, the image an admin builds for a site
(`hpcvod image`), and the checks at submit (docs/containers.md)."""
