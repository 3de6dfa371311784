"""Conversation corpora and their rendering into training examples."""
