"""Word alignment: the aligner over encoder states, AER/P/R/F1, the statistical peer (eflomal), reports."""
