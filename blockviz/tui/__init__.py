"""The Textual TUI: the App (app.py), its views (widgets/), its messages, and the playback
controller (controller.py, no textual import). Nothing is imported here, so the controller and the
bridge protocol load without textual."""
