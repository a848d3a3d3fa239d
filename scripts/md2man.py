#!/usr/bin/env python3
"""Turns one of dld's Markdown docs into a manual page (man(7) macros), so that the page and
the doc cannot drift apart: `md2man.py docs/configuration.md dld.conf 5 "dld configuration"`.
Handles what dld's docs use: headings, paragraphs, bullet lists, fenced code, tables (each row
becomes a tagged paragraph), `code`, **bold** and [links](url) (their text is kept)."""
import re
import sys


def inline(text):
    text = text.replace("\\", "\\e")
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return text


def line_out(text):
    # A line that starts with a dot or a quote would be read as a request.
    return "\\&" + text if text[:1] in (".", "'") else text


def convert(markdown, name, section, title):
    out = [f'.TH {name.upper()} {section} "" "dld" "{title}"']
    in_code = False
    paragraph = False
    header_row = False
    for raw in markdown.splitlines():
        if raw.startswith("```"):
            out.append(".fi" if in_code else ".nf")
            if in_code:
                out.append(".PP")
            in_code = not in_code
            continue
        if in_code:
            out.append(line_out(raw.replace("\\", "\\e")))
            continue
        line = raw.rstrip()
        if not line:
            paragraph = False
            continue
        if line.startswith("# "):
            out += [".SH NAME", f"{name} \\- {inline(line[2:])}", ".SH DESCRIPTION"]
        elif line.startswith("## "):
            out.append(".SH " + inline(line[3:]).upper())
        elif line.startswith("### "):
            out.append(".SS " + inline(line[4:]))
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            if not header_row and out and not out[-1].startswith(".TP"):
                # The first row of a table names its columns: not an entry of its own.
                header_row = True
                continue
            out += [".TP", line_out(inline(cells[0])), line_out(" \\(em ".join(inline(c) for c in cells[1:]))]
            continue
        elif re.match(r"^\s*([-*]|\d+\.) ", line):
            out += [".IP \\(bu 2", line_out(inline(re.sub(r"^\s*([-*]|\d+\.) ", "", line)))]
            paragraph = True
        else:
            if not paragraph and not line.startswith("  "):
                out.append(".PP")
            out.append(line_out(inline(line.strip())))
            paragraph = True
        header_row = False
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    source, name, section, title = sys.argv[1:5]
    with open(source, encoding="utf-8") as handle:
        sys.stdout.write(convert(handle.read(), name, section, title))
