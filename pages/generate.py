"""PLACEHOLDER: being built (issue 33/34); replaced before landing."""

import streamlit as st

st.info("This page is being built.")
