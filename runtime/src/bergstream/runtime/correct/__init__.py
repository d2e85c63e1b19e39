"""Corrections: write-audit-publish for a backfill of a past window.

`backfill run --branch NAME` writes the application's output of a window into branch NAME of its output
table (branch.py, writer.py), made from main with main's rows of the window removed; `backfill audit`
compares the branch's rows of the window with main's by the output's key (audit.py); `backfill publish`
replaces main's rows of the window with the branch's in one commit, while the live query goes on appending,
after tagging main's snapshot, and `backfill unpublish` puts them back (publish.py). The correction's
window and progress are kept in the output table's properties (state.py), so that each command can be run
again after a crash and does its work once.
"""
