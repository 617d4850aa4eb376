"""A mkdocs hook: the API reference page lists every name in `kerneltune.__all__` and
`kerneltune.kernels.__all__`, each rendered by mkdocstrings from its docstring."""

from __future__ import annotations

MARKER = "<!-- api-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    import kerneltune
    import kerneltune.kernels

    sections = []
    for module in (kerneltune, kerneltune.kernels):
        names = sorted(n for n in module.__all__ if not n.startswith("_"))
        sections.append(f"## `{module.__name__}`\n")
        for name in names:
            sections.append(
                f"::: {module.__name__}.{name}\n"
                "    options:\n"
                "      heading_level: 3\n"
                "      show_root_heading: true\n"
                "      show_root_full_path: true\n"
            )
    return markdown.replace(MARKER, "\n".join(sections))
