"""The demo training job of dist-resume, its records and their verification (``dist-resume demo``)."""
