"""Expert-offload tuning: routing profiles (profile.py), the GPU budget filled with the most
used experts (planner.py), the rule file that places them (rules_writer.py), and the plots."""
