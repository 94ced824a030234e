"""Token trees: growing a tree from the draft (drafter, budget), verifying it in one
target pass (attention), accepting a path exactly (acceptance) and running one
tree round (round).  May import: drafting and below.
"""
