"""User feedback: reading it from the span stream, joining it to the scores, and
measuring how well each metric predicts it."""
