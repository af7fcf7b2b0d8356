"""The from-scratch encoder of chapter 3: its config, the model, what identifies one, and BERT's weights in it."""
