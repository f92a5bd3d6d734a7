"""Views of the event stream: fold, usage, report, the terminal console. Imports no other turbospark package."""
