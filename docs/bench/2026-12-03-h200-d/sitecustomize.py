# lab only (call D3): every Python process of this run hands the GIL on after 0.5 ms
import sys

sys.setswitchinterval(0.0005)
